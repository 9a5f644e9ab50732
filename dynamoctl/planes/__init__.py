"""Communication planes between dynamoctl processes (ZeroMQ): the request plane streams
responses from workers to frontends; the event plane carries KV events and load metrics from
workers to routers. See docs/planes.md."""
