"""``paracube diagnose``: where a run's scaling went.

A run's metrics carry every rank's phase times for every step (:mod:`paracube.ranktimes`).
:mod:`.records` reads and checks them, :mod:`.breakdown` splits the step time into what
was lost where (adding up to the measured step), :mod:`.verdict` ranks the causes with
their fixes, :mod:`.pictures` draws the per-rank bars and writes a Chrome/Perfetto trace.
"""
