from dynamoctl.cli import main

main()
