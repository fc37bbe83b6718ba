"""The Ray Serve side of the runtime: the replica (``SpecLLMServer``), its engine class, metrics, controller link
and start-up calibration, and the HTTP ingress. Runs in Serve's replica processes."""
