"""The server's processes: `latlab serve` (wsgi.serve) runs Granian, whose workers each build the one-process app or,
with [server] frontends >= 2, a front end (frontend) that hands requests over a ZeroMQ hop (hop) to the engine
process owning the deployments (engine), started, restarted and stopped last by its supervisor (supervisor); the
run folder and the memory-mapped state those processes share (shared)."""
