"""The worker side: heartbeat, lease state, progress cell, sampling and the shared ticker."""
