from fedray.cli import main

main()
