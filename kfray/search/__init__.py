"""The search itself: MAP-Elites archives, parent sampling, islands (pure logic behind thin Ray
actors), migration topologies, the QD gradient and the shared prompt-evolver actor."""

__all__: list[str] = []       # modules are imported by name: kfray.search.island, .archive, ...
