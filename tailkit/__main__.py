from tailkit.allocator import reexec_with_tuned_malloc

reexec_with_tuned_malloc()  # before the CLI's imports: the restart then costs little

from tailkit.cli import main

main()
