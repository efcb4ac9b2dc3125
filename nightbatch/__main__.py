from nightbatch.cli.main import main

raise SystemExit(main())
