"""NATS JetStream: stream specs, event models, the planning reader and the publisher."""
