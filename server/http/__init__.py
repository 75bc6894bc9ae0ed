"""The HTTP layer: the Flask app and its Open Inference Protocol routes (app), the infer route answered in front of
Flask from the WSGI environ with the one mapping of serving errors to statuses (fastpath), the checks a request
passes before its body is read (guards), the OpenAPI description (openapi) and the observer listener that serves
/metrics and health on a port of its own (observer). It reads deployments through runtime/ and never knows whether
it runs in one process or in a front end (processes/)."""
