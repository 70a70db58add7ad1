from tuned.commands.cli import main

raise SystemExit(main())
