"""The built-in probes, one module each; `adaptive_gate.probes` is their public face and picks among them."""
