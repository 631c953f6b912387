"""Where the NATS server is and how to log in: plain values (pydantic only, no nats-py), read by
the settings, the `nats` resource (its fields are these) and a session (events/bus.py)."""

from __future__ import annotations

import ssl

from pydantic import BaseModel, ConfigDict, Field

# Never a guessed server: no URL (no NATS_URL, no running local stack) fails every connection so.
NO_NATS = "no NATS server chosen: start the local stack (make dev) or set NATS_URL"


class ConnectOptions(BaseModel):
    """How to reach NATS with JetStream."""

    model_config = ConfigDict(frozen=True)

    url: str | None = Field(
        default=None,
        description="Server URL(s), e.g. nats://127.0.0.1:4223: NATS_URL, else the running local stack's; "
        "none: every connection fails saying so, never a guessed server.",
    )
    token: str | None = Field(default=None, description="Auth token; pass dg.EnvVar('NATS_TOKEN').")
    user: str | None = Field(default=None, description="User name; pass dg.EnvVar('NATS_USER').")
    password: str | None = Field(default=None, description="Password; pass dg.EnvVar('NATS_PASSWORD').")
    creds_file: str | None = Field(default=None, description="NATS .creds file (JWT + nkey seed) path.")
    tls_ca_file: str | None = Field(default=None, description="CA bundle that signs the server certificate.")
    tls_cert_file: str | None = Field(default=None, description="Client certificate for mutual TLS.")
    tls_key_file: str | None = Field(default=None, description="Key of the client certificate.")
    connect_timeout_s: float = Field(default=2.0, gt=0, description="Seconds to wait for the connection.")
    request_timeout_s: float = Field(
        default=5.0, gt=0, description="Seconds to wait for a JetStream reply/ack."
    )

    def tls_context(self) -> ssl.SSLContext | None:
        if not (self.tls_ca_file or self.tls_cert_file):
            return None
        context = ssl.create_default_context(cafile=self.tls_ca_file)
        if self.tls_cert_file:
            context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        return context


class StreamOptions(BaseModel):
    """How this system's JetStream streams are created."""

    stream_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="Replicas of the JetStream streams this system creates (FLEET_NATS_REPLICAS).",
    )
