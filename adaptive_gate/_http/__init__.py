"""The ASGI side: which routes are gated, reading a body, waiting in line while listening for the
client, the gate's answers (`503`/`429`, `413`, `408`), its endpoints and pages, the lifespan and the
background loops it starts."""
