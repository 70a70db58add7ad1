from tuned.profiler.cli import main

raise SystemExit(main())
