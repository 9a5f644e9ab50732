"""The environment variables through which components receive key material.

Values are the material itself (a Z85 key, PEM text), never a path: a path would have to
exist on every host, and the launchers deliver environment variables to any host without
a command line (docs/security.md, "Key material").
"""

from __future__ import annotations

CURVE_SECRET_KEY = "DYNAMOCTL_CURVE_SECRET_KEY"
"""The deployment's CURVE secret key (Z85, 40 characters). Set: the request and event
planes authenticate and encrypt with it; unset: they run in the clear."""

ETCD_CA = "DYNAMOCTL_ETCD_CA"
"""PEM of the CA that signed the etcd server's certificate (clients verify the server)."""
ETCD_CERT = "DYNAMOCTL_ETCD_CERT"
"""PEM of this client's certificate, presented to an etcd that requires client certs."""
ETCD_KEY = "DYNAMOCTL_ETCD_KEY"
"""PEM of this client's private key."""
ETCD_USERNAME = "DYNAMOCTL_ETCD_USERNAME"
"""etcd user (etcd's own authentication, on top of TLS), with :data:`ETCD_PASSWORD`."""
ETCD_PASSWORD = "DYNAMOCTL_ETCD_PASSWORD"
"""That user's password."""

ETCD_SERVER_CERT = "DYNAMOCTL_ETCD_SERVER_CERT"
"""PEM of a managed etcd's own certificate (server and peer)."""
ETCD_SERVER_KEY = "DYNAMOCTL_ETCD_SERVER_KEY"
"""PEM of a managed etcd's private key."""

CONTROL_TOKEN = "DYNAMOCTL_CONTROL_TOKEN"
"""The bearer token of the supervisor's control endpoint, given to the components that
call it (the planner's ``scale`` requests)."""
