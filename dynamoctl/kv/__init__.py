"""KV-cache identity shared by engines and the router: chained block hashes."""
