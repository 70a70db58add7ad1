from tuned.profiler.command import main

raise SystemExit(main())
