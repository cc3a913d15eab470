import io
import unittest

import torch
import torch._dynamo


# torch's config.patch on a unittest.TestCase class patches around the class's tests (setUpClass/tearDownClass);
# PyTorch's own dynamo tests decorate their test classes this way
@torch._dynamo.config.patch(cache_size_limit=3)
class PatchedTests(unittest.TestCase):
    def test_limit_inside(self):
        print("inside:", torch._dynamo.config.cache_size_limit)
        f = torch.compile(lambda x: x * 2)
        print(f(torch.arange(3)).tolist())


suite = unittest.defaultTestLoader.loadTestsFromTestCase(PatchedTests)
res = unittest.TextTestRunner(stream=io.StringIO()).run(suite)
print("ran:", res.testsRun, "ok:", res.wasSuccessful(), PatchedTests.__name__)
print("after:", torch._dynamo.config.cache_size_limit)
