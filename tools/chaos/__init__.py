"""Chaos testing of a running Tidewater cluster (``tide chaos``).

Modules, one job each:

| module       | job                                                              |
|--------------|------------------------------------------------------------------|
| targets.py   | the clusters chaos acts on: ``ComposeCluster`` (docker-compose)    |
|              | and ``LocalChaosCluster`` (``tide cluster up``), same interface    |
| schedule.py  | the seeded fault plan (pure)                                       |
| workload.py  | producers writing unique values with acks=all, and the ack log     |
| txn_workload.py | ``--transactional``: an exactly-once consume-transform-produce  |
|              | app (confluent-kafka, Kafka transactions) and its output read back |
| monitor.py   | samples partition leaders to measure seconds without a leader      |
| replicas.py  | reads each broker's data folder to compare replicas below the HW  |
| verdict.py   | judges acknowledged vs read-back records (pure) and prints a table |
| runner.py    | runs it all and writes the output folder                           |
"""
