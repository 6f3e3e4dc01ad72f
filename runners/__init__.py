"""devplace runners: hydra apps that turn a config into library objects and call the library."""

from omegaconf import OmegaConf

# ``hydra.run.dir: ${or:${output_dir},outputs/APP/DATE/TIME}``: with output_dir=PATH the run
# writes into PATH only (no second, empty, time-stamped folder).
if not OmegaConf.has_resolver("or"):
    OmegaConf.register_new_resolver("or", lambda a, b: b if a in (None, "") else a)
