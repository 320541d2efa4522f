"""What every entry point shares around absl: `run(main)` and the `--verbose` flag.

    from experiments import cli
    if __name__ == "__main__":
        cli.run(main)
"""
import sys

from absl import app, flags

VERBOSE = flags.DEFINE_bool("verbose", False, "Also show other libraries' INFO logs (Orbax, "
                            "JAX's backend probes).")

# absl's help flags: after printing the usage text absl exits with status 1.
_HELP_FLAGS = ("--help", "-h", "-?", "--helpshort", "--helpfull", "--helpxml")


def run(main) -> None:
    """`absl.app.run(main)`, with two differences a user sees.

    - Before `main` starts, other packages' INFO lines are dropped from the console
      (`run_logging.quiet_third_party_logs`; `--verbose` keeps them).
    - A help flag exits with status 0 after the usage text: asking for help is not an
      error (absl exits with 1).
    - A config's `train.remat="auto"` is decided by the memory planner for the devices
      and memory of this machine, and logged (`drubric_jax.memory.remat.install`).
    - A bad config value (`ConfigError`: the field and what is wrong) or a `--config.`
      override naming no field (ml_collections' "Did you mean ...") ends with one
      `error:` line and status 2, not a traceback.

    Raises:
        SystemExit: as `app.run` does; status 0 where the command line asked for help,
            2 for the input errors above.
    """
    from drubric_jax.types import ConfigError

    started = []

    def quiet_main(argv):
        from drubric_jax.memory import remat
        from drubric_jax.rounds import run_logging

        started.append(True)
        run_logging.quiet_third_party_logs(not VERBOSE.value)
        # train.remat "auto" decided by the memory planner for this machine's devices.
        remat.install()
        return main(argv)

    try:
        app.run(quiet_main)
    except SystemExit as e:
        # Only absl's own help exit is changed; main never ran (flags parse first).
        if e.code == 1 and any(a.split("=")[0] in _HELP_FLAGS for a in sys.argv[1:]):
            raise SystemExit(0) from None
        raise
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except AttributeError as e:
        # Raised while the flags parse (main not started): an override of a field the
        # config does not have. ml_collections quotes the name and its nearest field.
        if started or not any(a.startswith("--config.") for a in sys.argv[1:]):
            raise
        text = str(e).strip("'\"").replace("\\n", " ").replace("\\'", "'")
        print(f"error: a --config override names no config field: {text}", file=sys.stderr)
        raise SystemExit(2) from None
