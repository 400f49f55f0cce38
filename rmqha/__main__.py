from rmqha.cli import main

raise SystemExit(main())
