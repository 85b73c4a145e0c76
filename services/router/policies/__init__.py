"""Router policies, one per file; ``build_policy`` maps a config name to an instance."""

from __future__ import annotations

from collections.abc import Callable

from services.router.config import RouterConfig
from services.router.policies.base import Decision, Policy, RouteContext
from services.router.policies.cache_aware import CacheAwarePolicy
from services.router.policies.holder import HolderPolicy
from services.router.policies.least_loaded import LeastLoadedPolicy
from services.router.policies.pack import PackPolicy
from services.router.policies.prefix_hash import PrefixHashPolicy
from services.router.policies.round_robin import RoundRobinPolicy

_FACTORIES: dict[str, Callable[[RouterConfig], Policy]] = {
    "cache_aware": lambda cfg: CacheAwarePolicy(cfg.prefill_us_per_token, cfg.kvstore_cost_ratio,
                                                    cfg.route_tolerance),
    "prefix_hash": lambda cfg: PrefixHashPolicy(),
    "least_loaded": lambda cfg: LeastLoadedPolicy(),
    "holder": lambda cfg: HolderPolicy(cfg.decode_holder_slack),
    "pack": lambda cfg: PackPolicy(),
    "round_robin": lambda cfg: RoundRobinPolicy(),
}


def build_policy(name: str, cfg: RouterConfig) -> Policy:
    return _FACTORIES[name](cfg)


__all__ = ["Decision", "Policy", "RouteContext", "build_policy"]
