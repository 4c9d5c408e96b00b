"""Tools that use the core and are not on its path: benchmarks (bench), the §6 diagnostic (diagnose), the
official WebShop install check (webshop_doctor). Run them as modules from the repository root:
`python -m tools.bench sched`."""
