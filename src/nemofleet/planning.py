"""The planner's entry for a host: which plan (a single host's, plan.make_plan, or a serving
group member's, multinode.make_group_plan) from its HostFacts and Settings.

Above plan.py and multinode.py (both pure, multinode building on plan's parts), below the
decision (desired.decide) and the preflight checks: the import graph points one way.
"""

from __future__ import annotations

from . import factmodel
from . import models as catalog
from . import multinode, plan, settings, versions
from .plan import PlanError  # noqa: F401  (callers catch it from here)



def for_host(host: str, facts: factmodel.Facts, s: settings.Settings, group_facts: dict | None = None) -> plan.Plan:
    """The plan for a host from its Facts and Settings; `group_facts`: {member: Facts | PeerMissing}
    of its whole serving group (this host included) when it is in one. Raises PlanError."""
    docker, tk = facts.docker, facts.toolkit
    make = multinode.make_group_plan if s.serving_group else plan.make_plan
    kw = {"peers": group_facts} if s.serving_group else {}
    gpus = plan.gpus_from_facts(facts.gpus.gpus)
    try:
        return make(
            host, gpus, s,
            # a CDI spec exists, or the toolkit can generate one (the host configuration does)
            docker_version=docker.server,
            cdi_available=bool(tk.cdi_specs) or versions.parse(tk.version) >= versions.MIN_TOOLKIT,
            cgroup_version=facts.cgroup, cgroup_driver=docker.cgroup_driver,
            local_meta=checkpoint_meta(facts, s), health=facts.health, **kw,
        )
    except plan.PlanError as exc:
        # a refusal counts whole GPUs only: name the ones MIG kept out, or "3x A100" on a 4-GPU
        # host reads as a wrong fact (the MIG warning goes with the plan that was not made)
        mig = [g for g in gpus if g.mig == "Enabled"]
        text = str(exc)
        if mig and "MIG" not in text:
            which = ", ".join(str(g.index) for g in mig)
            raise plan.PlanError(
                f"{text} (GPU {which} {'has' if len(mig) == 1 else 'have'} MIG enabled and {'is' if len(mig) == 1 else 'are'} "
                f"not counted: vLLM needs whole GPUs; nvidia-smi -i {mig[0].index} -mig 0 and a GPU reset give "
                f"{'it' if len(mig) == 1 else 'them'} back)") from None
        raise


def checkpoint_meta(facts: factmodel.Facts, s: settings.Settings) -> factmodel.ModelDir | None:
    """What the checkpoint on the host says of itself (config.json, index), for this commit's
    directory or, before it exists, any directory of the same repo."""
    models = facts.models
    model = s.model
    same = models.get(catalog.host_dir_name(model.repo, model.revision))
    if same:
        return same
    repo = catalog.local_dir_name(model.repo)
    return next((meta for name, meta in sorted(models.items()) if name.split("@", 1)[0] == repo), None)
