"""KV-cache identity shared by engines and the router: block hashes and KV events."""
