"""`latlab fleet`: replicas of one server config behind HAProxy, supervised, rolled and watched."""
