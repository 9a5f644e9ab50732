"""OpenAI's Responses API (``POST /v1/responses``, ``GET`` and ``DELETE
/v1/responses/{id}``) on the chat pipeline: a request is validated (:mod:`.protocol`),
its input items and the stored conversation it continues turned into chat messages
(:mod:`.translate`), generated as any chat, and answered as a response object or its
typed stream events (:mod:`.events`); responses are kept in a bounded store
(:mod:`.store`) for ``previous_response_id`` and retrieval."""
