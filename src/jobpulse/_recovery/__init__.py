"""Recovery and control: the sweeper and remote cancel."""
