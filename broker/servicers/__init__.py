"""The broker's gRPC servicers: Broker, BrokerControl and the forwarded Controller service."""
