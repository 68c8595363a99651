// Starts s3rver (an S3-compatible server from npm, installed by scripts/install-deps.sh
// into .npm-deps) on a free loopback port for tests/remote_test.cc:
//   node --openssl-legacy-provider s3rver_launch.js DATA_DIR PORT_FILE
// (s3rver 3.7.1 encrypts ListObjectsV2 continuation tokens with DES; OpenSSL 3 has it
// in its legacy provider only, and without it every truncated listing is a 500.)
// Creates the bucket "test", writes the port to PORT_FILE once listening, and exits
// when its parent (the test) is gone. Accounts: s3rver's default key pair S3RVER/S3RVER.
const fs = require('fs');
const S3rver = require('s3rver');

const [dir, portFile] = process.argv.slice(2);
const parent = process.ppid;
const server = new S3rver({
  address: '127.0.0.1',
  port: 0,
  directory: dir,
  silent: true,
  configureBuckets: [{ name: 'test', configs: [] }],
});
server.run().then(({ port }) => {
  fs.writeFileSync(portFile + '.tmp', String(port));
  fs.renameSync(portFile + '.tmp', portFile);
});
setInterval(() => {
  try {
    process.kill(parent, 0);
  } catch (e) {
    process.exit(0);
  }
}, 500);
