'use strict';
// Runs pouchdb-server inside this process, so its pid is the server's, and
// exits when stdin closes: the parent (test run, demo, dev-server) died or let
// go of us. A temporary server is told its data directory in
// COUCH_LEDGER_REMOVE_AT_EXIT and removes it then, since a parent that exits
// without stopping us (a test binary holding its server in a static) cannot.
var removeAtExit = process.env.COUCH_LEDGER_REMOVE_AT_EXIT;
function exit() {
  if (removeAtExit) {
    try {
      require('fs').rmSync(removeAtExit, { recursive: true, force: true });
    } catch (e) {
      // Nothing more to do: the next start removes data left by dead servers.
    }
  }
  process.exit(0);
}
process.argv = [process.argv[0], 'pouchdb-server'].concat(process.argv.slice(2));
process.stdin.on('end', exit);
process.stdin.on('error', exit);
process.stdin.resume();
require('pouchdb-server/lib/index.js');
