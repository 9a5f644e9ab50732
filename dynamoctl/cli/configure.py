"""``dynamoctl configure``: recommend a deployment from model, hardware and SLA with AI
Configurator (no GPU needed), write it as a recipe, and optionally check the prediction by
simulation (docs/configure.md). Flags: :class:`~dynamoctl.configure.options.ConfigureOptions`."""

from __future__ import annotations

import typer

from dynamoctl.configure.options import ConfigureOptions
from dynamoctl.settings import with_options

EXAMPLES = """Examples:

  dynamoctl configure --model meta-llama/Meta-Llama-3.1-70B --system h100_sxm \\
      --target-kind slurm --gpus 16 --isl 4000 --osl 500 --ttft 1000 --tpot 50

  dynamoctl configure --model Qwen/Qwen3-8B --gpus 1 --isl 1024 --osl 128 --verify

  dynamoctl configure --model ./my-model --from-recipe recipes/llama70b-disagg.yaml \\
      --trace mooncake.jsonl --out llama.yaml --profile-out llama-profile.json
"""


def register(app: typer.Typer) -> None:
    app.command("configure", epilog=EXAMPLES)(with_options(configure, options=ConfigureOptions))


def configure(*, options: ConfigureOptions) -> None:
    """Recommend parallelism, agg or disagg, and replica counts for a model on some GPUs
    under TTFT/TPOT targets (AI Configurator's per-operation GPU data); print the top
    configurations, write a ready recipe and a Pareto plot."""
    import msgspec
    from rich.console import Console

    from dynamoctl.configure import aic
    from dynamoctl.configure.models import ConfigureError
    from dynamoctl.configure.recipe_out import (
        build_recipe,
        check_gpus,
        choose,
        dump_recipe,
        target_shape,
    )
    from dynamoctl.configure.report import candidates_table, pareto_plot

    console = Console()
    if not console.is_terminal:  # a pipe or a log: do not squeeze the table to 80 columns
        console = Console(width=160)
    try:
        target, discovery = options.source()
        nodes, per_node = target_shape(target)
        gpus = options.gpus or nodes * per_node
        check_gpus(gpus, target)
        answer = aic.answer(options.question(gpus))
        chosen, units = choose(answer, target, options.mode)
        console.print(candidates_table(answer, chosen))
        recipe = build_recipe(
            answer, chosen, units, name=options.name, served_name=options.model_name(),
            target=target, discovery=discovery,
        )  # fmt: skip
        text = dump_recipe(recipe, answer, chosen, units)
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(text)
        plot = pareto_plot(answer, chosen, options.plot or options.out.with_suffix(".png"))
        console.print(f"chosen: {chosen.label()} on {units} unit(s); wrote {options.out}, {plot}")
        if options.profile_out is not None:
            from dynamoctl.configure.profile import write_profile

            write_profile(answer, chosen, options.model_name(), options.profile_out)
            console.print(f"wrote planner profile {options.profile_out}")
        if options.verify:
            from dynamoctl.configure.verify import comparison_table, verify

            result = verify(answer, chosen, units, options, console)
            console.print(comparison_table(result))
            report = options.out.with_suffix(".verify.json")
            report.write_bytes(msgspec.json.format(msgspec.json.encode(result), indent=2))
            console.print(f"wrote {report}")
    except ConfigureError as exc:
        typer.echo(f"dynamoctl configure: {exc}", err=True)
        raise typer.Exit(1) from exc
