"""The fleet plan: a discrete-event model of one replica, fitted to and checked against a lab run, and the fleets of
CPU and GPU replicas that serve a day of traffic within an SLO, with what each costs."""
