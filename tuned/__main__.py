from tuned.cli import main

raise SystemExit(main())
