'use strict';
// Runs pouchdb-server inside this process, so its pid is the server's, and
// exits when stdin closes: the parent (test run, demo) died or let go of us.
process.argv = [process.argv[0], 'pouchdb-server'].concat(process.argv.slice(2));
process.stdin.on('end', function () { process.exit(0); });
process.stdin.on('error', function () { process.exit(0); });
process.stdin.resume();
require('pouchdb-server/lib/index.js');
