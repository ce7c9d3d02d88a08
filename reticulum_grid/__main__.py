from reticulum_grid.cli import main

main()
