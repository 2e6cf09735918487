"""Who a client is and what it may do: settings, the authorizer, gRPC authentication."""
