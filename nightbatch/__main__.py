from nightbatch.cli import main

raise SystemExit(main())
