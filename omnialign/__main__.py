from omnialign.cli import main

main()
