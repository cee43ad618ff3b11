"""Engine tests: plain-def queue logic (topics, channels, queues, syncer) on trio's mock clock."""
