"""Many users on one deployment: API keys with names, priority classes and limits
(docs/security.md, "The key file"), enforced at the frontend."""
