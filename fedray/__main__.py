from fedray.front.cli import main

main()
