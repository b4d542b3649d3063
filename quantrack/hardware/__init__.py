"""Hardware facts and the rules over them: the GPU/model catalogs, NVML, the FP8 probe, units, dated prices,
the capacity arithmetic, the rulebook and preflight."""
