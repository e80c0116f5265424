from tailkit.native.restart import restart_with_settled_environment

restart_with_settled_environment()  # before the CLI's imports: the restart then costs little

from tailkit.cli import main

main()
