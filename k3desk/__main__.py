from k3desk.app import main

raise SystemExit(main())
