"""The failure-class harness's fixtures (`tests/api/test_surface_failures.py`), for
`test_responses_failures.py`: a scripted upstream stand-in (`stand_in`, `scripted`) and
gateways on the client protocol `gateway serve` runs (`front`)."""

from tests.api.test_surface_failures import front, scripted, stand_in

__all__ = ["front", "scripted", "stand_in"]
