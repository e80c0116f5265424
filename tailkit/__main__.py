from tailkit.cli import main

main()
