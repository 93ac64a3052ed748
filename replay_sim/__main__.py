"""``python -m replay_sim`` runs the CLI."""

from replay_sim.cli import main

main()
