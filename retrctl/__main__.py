from retrctl.cli import main

main()
