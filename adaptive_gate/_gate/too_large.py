"""Routes whose requests do not fit on the card even alone, answered at the door.

A request too large for the card fails once it allocates, a part of its work in: the gate calls it
`too_large`, and it teaches the controller nothing. But it held a slot until then, and where all of
a route's requests are that large (an endpoint for inputs the card cannot take, or a neighbour that
left too little for any of them), its clients, answered fast, send the next at once: the slots fill
with requests that hold nothing and fail, and the requests that fit wait behind them (a quarter of
what a reader of the card serves, in a mix of two routes whose large one never fit).

So a route whose last `IN_A_ROW` requests were all too large, with no success between, is answered
`too_large` at the door, but for one request per `RETRY_S`, which tries whether the card takes it
again (a neighbour left, the inputs changed). The first success of the route lets it in again. A
route whose too-large requests come among ones that fit (one large input now and then) never gets
there: their successes clear the count.

Where `cost` tells a route's requests apart, the door is for those at least as heavy as the lightest
that was too large, and only a success that heavy opens it: a light request that fits says nothing
of a heavy one, and each heavy one let in waits for the card to empty (a request alone always goes
in) before it fails.
"""

from __future__ import annotations

import math

__all__ = ["IN_A_ROW", "RETRY_S", "TooLargeRoutes"]

IN_A_ROW = 3  # too large in a row, with no success of the route between, before the door closes
RETRY_S = 1.0  # while it is closed, one request of the route a second tries the card again
MAX_ROUTES = 64  # routes remembered (bounded, whatever the app has): the oldest is forgotten first


class TooLargeRoutes:
    """Per route: how many requests in a row were too large, when one was last let through, and the
    fewest slots one of them weighed."""

    def __init__(self) -> None:
        # route -> [too large in a row, last let through, the fewest slots of those]; empty while no route's
        # requests were too large since one as heavy fitted, which every admission and success asks (one
        # truth test of a dict, as `ServiceEstimates.mean_by_route`)
        self.by_route: dict[object, list[float]] = {}

    def failed(self, route: object, now_s: float, units: float) -> None:
        """A request of `route` that weighed `units` slots was too large for the card."""
        entry = self.by_route.get(route)
        if entry is None:
            if len(self.by_route) >= MAX_ROUTES:
                del self.by_route[next(iter(self.by_route))]
            self.by_route[route] = [1.0, now_s, units]
        else:
            entry[0] += 1
            entry[2] = min(entry[2], units)

    def served(self, route: object, units: float) -> None:
        """A request of `route` that weighed `units` slots succeeded: the card takes its requests as
        heavy as that (one lighter than those that failed says nothing of them)."""
        entry = self.by_route.get(route)
        if entry is not None and units >= entry[2]:
            del self.by_route[route]

    def closed(self, route: object, units: float = math.inf) -> bool:
        """Whether `route`'s last `IN_A_ROW` requests at least as heavy as the lightest of them were too
        large, and a request of `units` is that heavy: `refuses` decides for each."""
        entry = self.by_route.get(route)
        return entry is not None and entry[0] >= IN_A_ROW and units >= entry[2]

    def refuses(self, route: object, now_s: float, units: float) -> bool:
        """Whether a request of `route` weighing `units` arriving at `now_s` is answered `too_large` at
        the door: the route's last `IN_A_ROW` that heavy were, and one was let through less than
        `RETRY_S` ago."""
        if not self.closed(route, units):
            return False
        entry = self.by_route[route]
        if now_s - entry[1] >= RETRY_S:
            entry[1] = now_s  # this one tries the card again
            return False
        return True

    def refused(self) -> list[str]:
        """The routes answered at the door now, by label, for the status."""
        return [str(getattr(route, "label", route)) for route in self.by_route if self.closed(route)]
