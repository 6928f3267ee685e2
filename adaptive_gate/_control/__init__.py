"""How the limit is chosen: the controllers (`control.py`), the one model of the card's memory they
read (`memory_model.py`: the others' bytes, each request's bytes, growth and OOM corrections), and
what a route weighs. Pure state machines: no loop, no HTTP, no probe library."""
