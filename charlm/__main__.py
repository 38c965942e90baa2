from charlm.cli.app import main

main()
