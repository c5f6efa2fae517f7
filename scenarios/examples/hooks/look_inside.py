# Hooks of scenarios/examples/hooks.yaml: what a user looks at inside a release cell that the
# scenario's keys do not say, returned by name; dmpcheck compares each across ranks and with
# `expect: observed`.
def hook_after_wrap(ctx):
    params = dict(ctx.model.named_parameters())
    return {
        "parameters": len(params),
        "trainable": sum(1 for p in params.values() if p.requires_grad),
        "tables_in_scenario": len(ctx.tables),
    }


def hook_after_step(ctx):
    # The dense layer's weight after each step, by its digest: equal on every rank, or not.
    weight = [p for name, p in ctx.model.named_parameters() if name.endswith("dense.0.weight")][0]
    return {"dense_weight": weight}


def hook_at_end(ctx):
    return {"steps_run": ctx.step}
