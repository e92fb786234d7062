"""The reader side: status snapshots, the cache, the watch hub and the polling backoff."""
