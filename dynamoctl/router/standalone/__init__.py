"""``dynamoctl router``: the router as its own process, asked by frontends over the
request plane (``route`` endpoint); replicas share their bookings on the event plane.
See docs/router.md, "Standalone router and replicas"."""
